"""One simulation and its outputs: the experiment that wires a config into a run
(experiment.py), its callbacks (callbacks.py) and trackers (trackers.py), several algorithms
on one trace (comparison.py), and which trace devices a run replays (replay.py)."""
