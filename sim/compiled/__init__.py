"""An optional compiled build of the simulation's hot path (the core and the few simulator
modules that step it), made by mypyc from the same sources: ``build`` makes it, ``switch`` puts
it in front of the sources when the command line asks for it."""
