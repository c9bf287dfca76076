"""Maps the top-level folders envs/, tools/ and sandboxes/ onto agentrl.envs, agentrl.tools and
agentrl.sandboxes (see DESIGN.md). Metadata lives in pyproject.toml."""

from setuptools import find_packages, setup

ROOTS = {"agentrl": "agentrl", "agentrl.envs": "envs", "agentrl.tools": "tools", "agentrl.sandboxes": "sandboxes"}

packages, package_dir = [], {}
for name, folder in ROOTS.items():
    package_dir[name] = folder
    packages.append(name)
    packages += [f"{name}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir)
