"""Operating a bookie: the admin HTTP server (http.py), its Prometheus metrics
(metrics.py), the status page (status.py) and the JSON shapes they share (views.py)."""
