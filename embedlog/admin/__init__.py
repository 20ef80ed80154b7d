"""Operating a bookie: the admin HTTP server (http.py) and its endpoints (routes.py), its
Prometheus metrics (metrics.py) and the status page (status.py); the JSON shapes it shares
with the CLI are embedlog.meta.views."""
