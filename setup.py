"""The packages of the distribution (the rest is in pyproject.toml): jaxpos and the repository's configs/, which
the wheel carries as jaxpos/_configs so that `jaxpos reproduce` runs from an installed wheel."""

from setuptools import find_namespace_packages, find_packages, setup

# A package mapped onto configs/ keeps one copy of each file (the user-facing folder) and puts it in sdist and wheel.
CONFIGS = ["jaxpos._configs", *(f"jaxpos._configs.{name}" for name in find_namespace_packages("configs"))]
setup(packages=[*find_packages(include=["jaxpos*"]), *CONFIGS], package_dir={"jaxpos._configs": "configs"})
