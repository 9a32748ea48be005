print "a Python 2 file, which check reports and skips"
