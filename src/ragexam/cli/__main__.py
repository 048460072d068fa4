"""`python -m ragexam.cli`: the `ragexam` command."""

from ragexam.cli.app import main

main()
