"""dsprof.cli"""
