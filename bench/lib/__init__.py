"""What the benchmark scripts share. Nothing is imported here: bench/lib/harness.py travels in
the corpus tarballs, which carry this file too and have the standard library only."""
