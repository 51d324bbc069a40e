"""roundpipe-parity: the parity matrix comparing roundpipe's scaler and runtime with torch's
(and apex's, where present), step by step, with Markdown/JSON/HTML reports. See docs/.
"""
