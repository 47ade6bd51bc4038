"""Benchmarks: the embedded generator (`demo`, `synth_*`), BIRD/Spider loaders (`loaders`), the folder format
(`benchmark`), loading any layout (`load`), a split's tasks for rollouts and training alike (`tasks`), typed gold
answers (`gold`, `cache`), database splits (`splits`), unshielded query costs (`measure`), statistics (`stats`) and
estimator calibration on training databases (`calibrate`)."""
