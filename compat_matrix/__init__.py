"""roundpipe-parity: the parity matrix comparing roundpipe's scaler and runtime with torch's
and apex's. It lands with the parity issue; see docs/.
"""
