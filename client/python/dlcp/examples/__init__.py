"""Runnable training examples (python3 -m dlcp.examples.digits --help)."""
