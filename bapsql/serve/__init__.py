"""Budgeted answers over your own SQLite: the `bapsql serve` service (registry, episodes, views, web app).

Import the pieces from their modules: `registry` (databases by name), `session` (one request = one logged
episode), `control` (deadlines, cancellation, the bounded queue), `views` (the JSON answers), `app` (FastAPI routes
and the web page). Local engines are driven by one batching scheduler thread (`bapsql.rollout.engines.batching`).
"""
