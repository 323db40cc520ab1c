package console

// ParseRefusals bridges parseRefusals to the external tests.
var ParseRefusals = parseRefusals
