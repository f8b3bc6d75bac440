from fedsim.cli import entry

entry()
