"""The worker's I/O: the service the Faust agents call, its lanes, write cache, timers, effect executor."""
