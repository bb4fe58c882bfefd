"""NVIDIA cuda-samples built by nvcc (build.py), run natively and under the tool on a GPU host
(run.py, from the tarball build.py --pack makes); samples.json says which, with their checks."""
