"""HeCBench programs, built here (build.py) and run natively and under the tool on a GPU host
(run.py, from the tarball build.py --pack makes; README.md)."""
