"""Page parts shared by the tabs: the settings form, the job panel, the system panel, event chains."""
