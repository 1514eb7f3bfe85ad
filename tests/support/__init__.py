"""What the tests and the benchmarks share: several Ray nodes on 127.0.0.1 that can be lost one at
a time (``local_cluster``), the runs that lose one (``node_loss``: the index job, Serve under
load, Ray Train), and one HTTP request with what came back (``replies``).

A benchmark run as a script puts the repository root on ``sys.path`` to import these; a test
imports them as ``tests.support.*``.
"""
