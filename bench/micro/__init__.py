"""CPU micro-benchmarks (`make bench` runs them) and the long fuzzing run of the parsers."""
