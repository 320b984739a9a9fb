"""Evals: scoring the team against golden sets (``relaygraph eval``).

Nothing is exported yet: the golden-set runner and its metrics arrive with the eval issue.
The package exists now so the import path users will write is fixed from the first release.
"""

__all__: list[str] = []
