"""Memory drift: trends and level jumps per signal, where start-up ends, host memory's leak
class."""
