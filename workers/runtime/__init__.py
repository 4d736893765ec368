"""The runtime every pool runs on: the job registry, queues, the worker runner, the scheduler and the stack."""
