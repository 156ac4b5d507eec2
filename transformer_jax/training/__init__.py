"""Training: optimizer, train state, the pure step, preemption, stopping rules, the loop."""
