"""`python -m creditlab`: the command line (creditlab.cli)."""

from creditlab.cli import main

if __name__ == "__main__":
    main()
