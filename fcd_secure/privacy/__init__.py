"""fcd_secure.privacy"""
