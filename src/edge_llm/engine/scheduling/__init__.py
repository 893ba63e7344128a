"""Who runs next: the scheduler, priorities, admission and the prefill budget."""
