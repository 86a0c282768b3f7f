"""fcd_secure.model"""
