"""The command line: one command per file, registered in main.py."""
