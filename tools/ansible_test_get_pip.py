"""Offline stand-in for ansible-test's pip bootstrap script.

ansible-test bootstraps pip into each sanity virtual environment by running get-pip.py, which it
downloads from ci-files.testing.ansible.com unless `~/.ansible/test/cache/get_pip_<version>.py`
exists. Where that host is unreachable, tools/ansible_sanity.sh copies this file there: it installs
the pip that the venv's Python bundles (ensurepip), then the requested pip from the package index
that pip is configured for (the one `make setup` uses). Called as get-pip.py is:
`python get_pip_X_Y.py [pip options] pip==X.Y [--no-setuptools] [--no-wheel]`."""

from __future__ import annotations

import subprocess
import sys

GET_PIP_OPTIONS = {"--no-setuptools", "--no-wheel"}  # get-pip.py's own, not pip install's


def main() -> None:
    pip_arguments = [argument for argument in sys.argv[1:] if argument not in GET_PIP_OPTIONS]
    subprocess.run(
        [sys.executable, "-m", "ensurepip", "--default-pip"], check=True, stdout=subprocess.DEVNULL
    )
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", *pip_arguments], check=True)


if __name__ == "__main__":
    main()
