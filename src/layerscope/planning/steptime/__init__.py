"""The step-time model: pipeline schedules, sharded steps, measured unit and rank times."""
