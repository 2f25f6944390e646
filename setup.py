"""Maps the card's top-level folders onto the `rollnet` import namespace.

Invariant: every package under node/, validator/ and trainer/ ships as rollnet.<folder>.<sub>, and the
composer's own sub-packages (rollnet/devnet) as rollnet.<sub>;
tests/test_packaging.py builds the wheel and checks it.
"""

from setuptools import find_packages, setup

ROLE_FOLDERS = ("node", "validator", "trainer")

packages = ["rollnet", *(f"rollnet.{sub}" for sub in find_packages("rollnet"))]
package_dir = {"rollnet": "rollnet"}
for folder in ROLE_FOLDERS:
    packages.append(f"rollnet.{folder}")
    package_dir[f"rollnet.{folder}"] = folder
    packages += [f"rollnet.{folder}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)
