package hypervisortest

import "testing"

func TestOCRFound(t *testing.T) {
	tests := []struct {
		text, token string
		want        bool
	}{
		{"/ # echo vmgatetebgtmw\nvmgatetebgtmw\n", "vmgatetebgtmw", true},
		{"“/ # echo vmgatetebgtmy\n\nvngatetebgtmu\n", "vmgatetebgtmw", true}, // what tesseract read once
		{"/ # echo VMGATE TEBG TMW\n", "vmgatetebgtmw", true},
		{"/ # echo vmgatexxxxtmw\n", "vmgatetebgtmw", false},
		{"vmgate\ntebgtmw\n", "vmgatetebgtmw", false}, // not across lines
		{"", "vmgatetebgtmw", false},
		// What tesseract read on VirtualBox's screen once: "q" as "gq" (a
		// letter added) and "y" as "u".
		{"“ # echo vmgatepwugqupz\nVngatepwugupz\n", "vmgatepwuqypz", true},
		{"/ # echo vmgatexxxxxxxx\n", "vmgatepwuqypz", false},
		{"vmgatepw\nuqypz\n", "vmgatepwuqypz", false},
	}
	for _, tt := range tests {
		if got := ocrFound(tt.text, tt.token); got != tt.want {
			t.Errorf("ocrFound(%q, %q) = %v; want %v", tt.text, tt.token, got, tt.want)
		}
	}
}
