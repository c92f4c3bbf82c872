"""Pure core: types, catalogs, memory/speed/cost models, planner. No hardware calls, no printing."""
