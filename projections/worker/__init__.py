"""Pure bookkeeping of the worker: admission, offsets, fold steps, the timer index."""
