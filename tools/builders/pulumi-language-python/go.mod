// Builds pulumi-language-python from sdk/v3, which carries it up to v3.78.0. sdk/v3's
// go.mod has a replace directive, so it is repeated here (go install @version refuses).
module kontinuum.local/tools/pulumi-language-python

go 1.26

require github.com/pulumi/pulumi/sdk/v3 v3.78.0

replace golang.org/x/text => golang.org/x/text v0.3.6
