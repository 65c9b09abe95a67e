"""How close the simulator comes to real executors: calibrating its cost model on the real
engine (``calibrate``), replaying a trace on both and comparing them (``validate``), and
measured runs of other engines (vLLM) as inputs (``measured``). The one package that imports
both ``sim`` and ``engine``."""
