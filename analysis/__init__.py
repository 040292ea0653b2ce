"""dsprof.analysis"""
