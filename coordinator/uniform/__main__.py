"""`python -m coordinator.uniform`: a conversion worker process (see `worker.py`)."""

from .worker import main

main()
