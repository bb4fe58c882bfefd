"""The sample apps' build scripts (build.py, build_hip.py), importable from the repository root
(`from samples import build`) and run as scripts (`python samples/build.py`)."""
