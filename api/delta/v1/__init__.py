"""Unity Catalog's Delta API v1.0 (`/api/2.1/unity-catalog/delta/v1`, the Managed Tables Specification v1.0):
its routes (`routes.py`, on the Delta blueprint) and its error model (`errors.py`)."""
