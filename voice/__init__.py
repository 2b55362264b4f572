"""The voice pipeline, one folder per stage: listen/ -> think/ -> speak/, with io/ the ways in and out.

session.py wires the stages into a conversation; events.py holds everything that travels between them.
"""
