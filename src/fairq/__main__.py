"""``python -m fairq``: the same command line as the ``fairq`` script."""

from fairq.cli import main

if __name__ == "__main__":
    main()
