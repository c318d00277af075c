"""CPU benchmark of both operators: ``swiglu_ops.bench`` (also ``swiglu-ops bench``). See its docstring.

python benchmarks/bench_cpu.py [--quick] [--out DIR]
"""

from swiglu_ops.bench import main

if __name__ == "__main__":
    raise SystemExit(main())
