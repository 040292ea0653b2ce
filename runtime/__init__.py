"""dsprof.runtime"""
