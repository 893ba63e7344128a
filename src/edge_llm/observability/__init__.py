"""observability"""
