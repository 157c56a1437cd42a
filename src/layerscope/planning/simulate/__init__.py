"""Every rank of a configuration simulated on fake tensors through capture's step engine, and the plan their memories make."""
