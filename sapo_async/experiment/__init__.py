"""The paper-table experiment: I/J configurations compared under common random numbers."""
