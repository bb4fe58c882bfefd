"""The benchmarks and correctness corpora, as a package run from the repository root:
`python -m bench.run`, `python -m bench.micro.cache_bench`, `python -m bench.corpora.hecbench.build`.

    bench/lib/       what the scripts share: results' provenance, the suite's report, the
                     CUPTI kernel trace, the fuzz targets, the build recipes
    bench/corpora/   programs built and run under the tool: apps/ (the six workloads),
                     hecbench/ and upstream_tests/ (differential tests on a GPU host)
    bench/micro/     CPU micro-benchmarks (`make bench`) and the long fuzzing run
    bench/*.py       the GPU suites: run.py, policy_bench.py, proteus_compare.py, ...

Nothing is imported here: the corpus runners travel to GPU hosts in tarballs that carry this
file, bench/lib/__init__.py and bench/lib/harness.py, and run there with the standard library
alone (`python3 -m bench.corpora.hecbench.run` from the unpacked tarball's top).
"""
