# Prints each Makefile target with the first line of the comment block above
# it (make help). Variable lines between the comment and the target keep it;
# a blank line ends it. A target without a comment is listed too.
/^# / { if (!comment) comment = substr($0, 3); next }
/^$/ { comment = ""; next }
/^[a-zA-Z0-9_.-]+:([^=]|$)/ {
  target = $1; sub(/:.*/, "", target)
  if (target == ".PHONY") next
  printf "  %-22s %s\n", target, comment
  comment = ""
}
