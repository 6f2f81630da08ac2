"""Synthetic and small reasoning data: word problems over finite monoids (state tracking) and catbAbI."""
