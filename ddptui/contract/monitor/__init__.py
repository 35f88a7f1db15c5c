"""What a run shows to those not watching it: Prometheus metrics (and, later, notifications)."""
