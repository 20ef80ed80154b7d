"""Helpers the tests share (cliutil, crashutil, servers, serving, the chaos rounds) and the
child processes they start and kill (*_child.py, run as scripts by their path)."""
