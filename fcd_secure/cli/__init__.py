"""fcd_secure.cli"""
