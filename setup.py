"""perfcheck: metadata, dependencies and the console script live in setup.cfg."""
from setuptools import setup

setup()
