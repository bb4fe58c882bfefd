"""Upstream Proteus's GPU test programs, built here without its plugin (build.py) and run natively
and under the tool on a GPU host (run.py, from the tarball build.py --pack makes; README.md)."""
