"""Studies: a base config swept over axes (study.py), run by the in-process backend in
lockstep (lockstep.py) or on Ray (ray_backend.py), with their progress (progress.py) and
their tables over seeds (tables.py)."""
