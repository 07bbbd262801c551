package vboxemu

import (
	"fmt"
)

// Version is one emulated VirtualBox release and what differs between the
// releases in the commands the emulator implements.
type Version struct {
	// Major, Minor, Build are VBOX_VERSION_MAJOR/MINOR/BUILD (Version.kmk,
	// Config.kmk in 6.1).
	Major, Minor, Build int
	// Revision is the release's SVN revision (VBOX_SVN_REV_VERSION_FALLBACK
	// of the release's Version.kmk).
	Revision int
	// Product and Vendor are VBOX_PRODUCT and VBOX_VENDOR (Config.kmk).
	Product, Vendor string
	// Year is VBOX_C_YEAR, the year the release was built.
	Year int
}

// The emulated releases; each call returns a new Version.

// V61 is VirtualBox 6.1.38.
func V61() *Version {
	return &Version{Major: 6, Minor: 1, Build: 38, Revision: 153438, Product: "Oracle VM VirtualBox", Vendor: "Oracle Corporation", Year: 2022}
}

// V70 is VirtualBox 7.0.18.
func V70() *Version {
	return &Version{Major: 7, Minor: 0, Build: 18, Revision: 162988, Product: "Oracle VM VirtualBox", Vendor: "Oracle and/or its affiliates", Year: 2024}
}

// V71 is VirtualBox 7.1.6.
func V71() *Version {
	return &Version{Major: 7, Minor: 1, Build: 6, Revision: 167084, Product: "Oracle VirtualBox", Vendor: "Oracle and/or its affiliates", Year: 2025}
}

// Versions lists the emulated releases, oldest first.
func Versions() []*Version { return []*Version{V61(), V70(), V71()} }

// LookupVersion finds an emulated release by "6.1", "7.0", "7.1" or its
// full number ("7.1.6"). The empty string means the newest.
func LookupVersion(s string) (*Version, error) {
	if s == "" {
		return V71(), nil
	}
	for _, v := range Versions() {
		if s == v.Short() || s == v.String() {
			return v, nil
		}
	}
	return nil, fmt.Errorf("vboxemu: no emulated VirtualBox %q (have 6.1, 7.0, 7.1)", s)
}

// String is VBOX_VERSION_STRING ("7.1.6").
func (v *Version) String() string { return fmt.Sprintf("%d.%d.%d", v.Major, v.Minor, v.Build) }

// Short is "major.minor".
func (v *Version) Short() string { return fmt.Sprintf("%d.%d", v.Major, v.Minor) }

// AtLeast reports whether v is major.minor or newer.
func (v *Version) AtLeast(major, minor int) bool {
	return v.Major > major || (v.Major == major && v.Minor >= minor)
}

// VersionLine is what `VBoxManage --version` prints (VBoxManage.cpp main:
// RTPrintf("%sr%u\n", VBOX_VERSION_STRING, RTBldCfgRevision())).
func (v *Version) VersionLine() string { return fmt.Sprintf("%sr%d\n", v.String(), v.Revision) }

// Logo is showLogo's text (VBoxManageHelp.cpp showLogo). 6.1 prints "(C)"
// and "All rights reserved."; 7.x prints "Copyright (C)".
func (v *Version) Logo() string {
	if !v.AtLeast(7, 0) {
		return fmt.Sprintf("%s Command Line Management Interface Version %s\n(C) 2005-%d %s\nAll rights reserved.\n\n",
			v.Product, v, v.Year, v.Vendor)
	}
	return fmt.Sprintf("%s Command Line Management Interface Version %s\nCopyright (C) 2005-%d %s\n\n",
		v.Product, v, v.Year, v.Vendor)
}

// ArgvImageFirst reports whether `guestcontrol run` makes the image argv[0]
// and appends every positional argument after it (7.0 and 7.1:
// gctlHandleRunCommon pushes the image, or --arg0, in front of aArgs);
// 6.1 puts every positional argument into aArgs, the first one becoming
// the image when --exe is absent.
func (v *Version) ArgvImageFirst() bool { return v.AtLeast(7, 0) }

// HasRunCwd reports whether `guestcontrol run` has --cwd (7.1 added it to
// gctlHandleRunCommon and to IGuestSession::ProcessCreate).
func (v *Version) HasRunCwd() bool { return v.AtLeast(7, 1) }

// HasRunArg0 reports whether `guestcontrol run` has --arg0 (7.0 and later).
func (v *Version) HasRunArg0() bool { return v.AtLeast(7, 0) }

// WaitResultLine is the line the run loop prints after every
// WaitForArray when verbose: 6.1 prints "waitResult: %d", 7.x prints
// "Wait result is '%s' (%d)" with gctlProcessWaitResultToText.
func (v *Version) WaitResultLine(r WaitResult) string {
	if !v.AtLeast(7, 0) {
		return fmt.Sprintf("waitResult: %d\n", r)
	}
	return fmt.Sprintf("Wait result is '%s' (%d)\n", r.text(), r)
}

// ExitCodeMessage is the first error line of a failed FindMachine
// (VirtualBoxImpl.cpp VirtualBox::findMachine): the same in every version.
func notFoundText(name string) string {
	return fmt.Sprintf("Could not find a registered machine named '%s'", name)
}

// contextSite is one CHECK_ERROR call site whose failure VBoxManage reports
// with GluePrintErrorContext: the stringified method call (comments drop
// out in the preprocessor) and its line, per version.
type contextSite struct {
	file   string
	method string
	line   map[string]int // Version.Short() -> line
}

// context returns the "Context: ..." line text for v.
func (s contextSite) context(v *Version) string {
	return fmt.Sprintf("Context: \"%s\" at line %d of file %s", s.method, s.line[v.Short()], s.file)
}

// The CHECK_ERROR sites the emulator can fail at, with their lines in each
// release's source.
var (
	siteGctlFindMachine = contextSite{"VBoxManageGuestCtrl.cpp", "FindMachine(Bstr(pCtx->pszVmNameOrUuid).raw(), machine.asOutParam())",
		map[string]int{"6.1": 797, "7.0": 676, "7.1": 676}}
	siteGctlWaitSession = contextSite{"VBoxManageGuestCtrl.cpp", "WaitForArray(ComSafeArrayAsInParam(aSessionWaitFlags), 30 * 1000, &enmWaitResult)",
		map[string]int{"6.1": 891, "7.0": 770, "7.1": 770}}
	siteGctlProcessCreate61 = contextSite{"VBoxManageGuestCtrl.cpp", "ProcessCreate(Bstr(pszImage).raw(), ComSafeArrayAsInParam(aArgs), ComSafeArrayAsInParam(aEnv), ComSafeArrayAsInParam(aCreateFlags), gctlRunGetRemainingTime(msStart, cMsTimeout), pProcess.asOutParam())",
		map[string]int{"6.1": 1483, "7.0": 1383}}
	siteGctlProcessCreate71 = contextSite{"VBoxManageGuestCtrl.cpp", "ProcessCreate(Bstr(pszImage).raw(), ComSafeArrayAsInParam(aArgs), Bstr(pszCwd).raw(), ComSafeArrayAsInParam(aEnv), ComSafeArrayAsInParam(aCreateFlags), gctlRunGetRemainingTime(msStart, cMsTimeout), pProcess.asOutParam())",
		map[string]int{"7.1": 1406}}
	siteGctlWaitStart = contextSite{"VBoxManageGuestCtrl.cpp", "WaitForArray(ComSafeArrayAsInParam(aWaitStartFlags), gctlRunGetRemainingTime(msStart, cMsTimeout), &waitResult)",
		map[string]int{"6.1": 1496, "7.0": 1396, "7.1": 1420}}
	siteInfoFindMachine = contextSite{"VBoxManageInfo.cpp", "FindMachine(Bstr(VMNameOrUuid).raw(), machine.asOutParam())",
		map[string]int{"6.1": 2772, "7.0": 3138, "7.1": 3218}}
	siteStartFindMachine = contextSite{"VBoxManageMisc.cpp", "FindMachine(Bstr(pszVM).raw(), machine.asOutParam())",
		map[string]int{"6.1": 721, "7.0": 867, "7.1": 906}}
	siteStartLaunch = contextSite{"VBoxManageMisc.cpp", "LaunchVMProcess(a->session, sessionType.raw(), ComSafeArrayAsInParam(aBstrEnv), progress.asOutParam())",
		map[string]int{"6.1": 726, "7.0": 880, "7.1": 919}}
	siteControlFindMachine = contextSite{"VBoxManageControlVM.cpp", "FindMachine(Bstr(a->argv[0]).raw(), machine.asOutParam())",
		map[string]int{"6.1": 382, "7.0": 365, "7.1": 363}}
	siteControlLock = contextSite{"VBoxManageControlVM.cpp", "LockMachine(a->session, LockType_Shared)",
		map[string]int{"6.1": 388, "7.0": 371, "7.1": 369}}
	siteControlPause     = contextSite{"VBoxManageControlVM.cpp", "Pause()", map[string]int{"6.1": 406, "7.0": 390, "7.1": 388}}
	siteControlResume    = contextSite{"VBoxManageControlVM.cpp", "Resume()", map[string]int{"6.1": 410, "7.0": 395, "7.1": 393}}
	siteControlReset     = contextSite{"VBoxManageControlVM.cpp", "Reset()", map[string]int{"6.1": 414, "7.0": 400, "7.1": 398}}
	siteControlPowerDown = contextSite{"VBoxManageControlVM.cpp", "PowerDown(progress.asOutParam())",
		map[string]int{"6.1": 619, "7.0": 604, "7.1": 602}}
	siteControlPowerButton = contextSite{"VBoxManageControlVM.cpp", "PowerButton()", map[string]int{"6.1": 673, "7.0": 660, "7.1": 658}}
	siteSnapFindMachine    = contextSite{"VBoxManageSnapshot.cpp", "FindMachine(bstrMachine.raw(), pMachine.asOutParam())",
		map[string]int{"6.1": 332, "7.0": 344, "7.1": 344}}
	siteSnapTake = contextSite{"VBoxManageSnapshot.cpp", "TakeSnapshot(name.raw(), desc.raw(), fPause, snapId.asOutParam(), progress.asOutParam())",
		map[string]int{"6.1": 475, "7.0": 487, "7.1": 487}}
	siteSnapFind = contextSite{"VBoxManageSnapshot.cpp", "FindSnapshot(Bstr(a->argv[2]).raw(), pSnapshot.asOutParam())",
		map[string]int{"6.1": 525, "7.0": 537, "7.1": 537}}
	siteSnapDelete = contextSite{"VBoxManageSnapshot.cpp", "DeleteSnapshot(bstrSnapGuid.raw(), pProgress.asOutParam())",
		map[string]int{"6.1": 542, "7.0": 554, "7.1": 554}}
	siteSnapRestore = contextSite{"VBoxManageSnapshot.cpp", "RestoreSnapshot(pSnapshot, pProgress.asOutParam())",
		map[string]int{"6.1": 548, "7.0": 560, "7.1": 560}}
	siteUnregFindMachine = contextSite{"VBoxManageMisc.cpp", "FindMachine(Bstr(VMName).raw(), machine.asOutParam())",
		map[string]int{"6.1": 148, "7.0": 229, "7.1": 228}}
	siteCloneFindMachine = contextSite{"VBoxManageMisc.cpp", "FindMachine(Bstr(pszSrcName).raw(), srcMachine.asOutParam())",
		map[string]int{"6.1": 558, "7.0": 668, "7.1": 700}}
	siteCloneFindSnapshot = contextSite{"VBoxManageMisc.cpp", "FindSnapshot(Bstr(pszSnapshotName).raw(), srcSnapshot.asOutParam())",
		map[string]int{"6.1": 567, "7.0": 677, "7.1": 715}}
	sitePropGetFindMachine = contextSite{"VBoxManageGuestProp.cpp", "FindMachine(Bstr(a->argv[0]).raw(), machine.asOutParam())",
		map[string]int{"6.1": 92, "7.0": 77, "7.1": 77}}
	siteGetExtraFindMachine = contextSite{"VBoxManageMisc.cpp", "FindMachine(Bstr(a->argv[0]).raw(), machine.asOutParam())",
		map[string]int{"6.1": 874, "7.0": 1338, "7.1": 1377}}
	siteSetExtraFindMachine = contextSite{"VBoxManageMisc.cpp", "FindMachine(Bstr(a->argv[0]).raw(), machine.asOutParam())",
		map[string]int{"6.1": 934, "7.0": 1398, "7.1": 1437}}
	siteModifyFindMachine = contextSite{"VBoxManageModifyVM.cpp", "FindMachine(Bstr(a->argv[0]).raw(), machine.asOutParam())",
		map[string]int{"6.1": 567, "7.0": 632, "7.1": 842}}
	siteModifyLock = contextSite{"VBoxManageModifyVM.cpp", "LockMachine(a->session, LockType_Write)",
		map[string]int{"6.1": 575, "7.0": 640, "7.1": 850}}
	siteModifyMemory = contextSite{"VBoxManageModifyVM.cpp", "COMSETTER(MemorySize)(ValueUnion.u32)",
		map[string]int{"6.1": 659, "7.0": 724, "7.1": 941}}
	siteModifyCPUs = contextSite{"VBoxManageModifyVM.cpp", "COMSETTER(CPUCount)(ValueUnion.u32)",
		map[string]int{"6.1": 877, "7.0": 946, "7.1": 1036}}
)
